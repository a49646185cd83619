package sim

import (
	"net/http"

	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// agentturn.go holds the steps of a turn that the Messages and Responses handlers take alike,
// each answering a failure in its API's error shape through fail500 (see injectFault).

// agentJob draws the turn's fault and returns the job that generates its reply of at most
// maxTokens for the prompt seq, following plan when the reply calls a tool. It returns false when
// the fault ended the request (see injectFault).
func (w *Worker) agentJob(rw http.ResponseWriter, fail500 func(rw http.ResponseWriter, msg string), model string,
	seq *prompt.Sequence, maxTokens int, ignoreEOS bool, plan *plannedCall) (*job, bool) {
	fault := w.drawFault()
	if w.injectFault(rw, fault, fail500) {
		return nil, false
	}
	j := &job{model: model, seq: seq, chat: true, maxTokens: maxTokens, ignoreEOS: ignoreEOS, fault: fault}
	if plan != nil {
		j.script = plan.script
	}
	return j, true
}

// agentReply runs j to its end for a non-streamed answer and returns the text it generated. When
// the request did not finish it answers 500 (unless the client has gone) and returns false.
func (w *Worker) agentReply(rw http.ResponseWriter, r *http.Request, fail500 func(rw http.ResponseWriter, msg string), j *job) (string, Result, bool) {
	text, res := w.generateText(r.Context(), j)
	if res.Err != nil {
		if r.Context().Err() == nil {
			fail500(rw, "request did not finish: "+res.Err.Error())
		}
		return "", res, false
	}
	return text, res, true
}
