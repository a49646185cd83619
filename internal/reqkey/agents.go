package reqkey

// ParseResponses reads a Responses API body (POST /v1/responses).
//
// Placeholder until the Responses schema reader lands: it reads the body as a chat body.
func ParseResponses(h Header, raw []byte) (*Request, error) { return Parse(h, raw) }

// ParseMessages reads an Anthropic Messages API body (POST /v1/messages).
//
// Placeholder until the Messages schema reader lands: it reads the body as a chat body.
func ParseMessages(h Header, raw []byte) (*Request, error) { return Parse(h, raw) }

// ParseModel reads only what load-only routes need of a JSON body: that it is a JSON object, its
// model and stream. It derives no session, hash or history key, so nothing is learned from it.
func ParseModel(h Header, raw []byte) (*Request, error) {
	r, err := Parse(h, raw)
	if err != nil {
		return nil, err
	}
	return &Request{Model: r.Model, Stream: r.Stream}, nil
}
