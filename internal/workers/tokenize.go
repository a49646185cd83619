package workers

// TokenizeOn is the worker to ask for the prompt tokens of a request for model, among its
// candidates (never empty): the least loaded, the first of equals, since the call adds to its
// work. It returns the model to ask it for and the LoRA adapter the tokens are for ("" for a base
// model): the worker's first base model for a request naming it or no model, the adapter itself
// for one of the worker's adapters, so that the engine renders the request as it will serve it.
// ok is false for any other model the worker lists (a second name without parent), or none: such
// a request is not tokenized, and routes by the prefix tree.
func TokenizeOn(candidates []*Worker, model string) (w *Worker, ask, lora string, ok bool) {
	w = candidates[0]
	for _, c := range candidates[1:] {
		if c.Load() < w.Load() {
			w = c
		}
	}
	models := w.Models()
	switch {
	case len(models) == 0:
		return w, "", "", false
	case model == "" || model == models[0]:
		return w, models[0], "", true
	}
	if _, ok := w.Adapter(model); ok {
		return w, model, model, true
	}
	return w, "", "", false
}
