package proxy

import (
	"github.com/cacheroute/cacheroute/internal/workers"
)

// models.go is where a request's model meets the workers' model lists.

// candidates returns the workers that may take a request for model and the served model its
// state (prefix tree, sessions, admission counts) is kept under, as workers.Pool.Candidates finds
// them, and ok false when the request is to be refused 404.
//
// A model no healthy worker lists is forwarded, as the vLLM router forwards any name: every
// available worker is a candidate and answers for itself (vLLM with its own 404, a worker that
// ignores the name with an answer). Its state is kept under no model (""), never under the name,
// so that whatever names clients send leave no per-name state or metric series behind. With
// StrictModels such a request is refused instead, without contacting a worker.
func (s *Server) candidates(model string) (candidates []*workers.Worker, served string, ok bool) {
	candidates, served, known := s.pool.Candidates(model)
	if known {
		return candidates, served, true
	}
	if s.opts.StrictModels {
		return nil, "", false
	}
	candidates, _, _ = s.pool.Candidates("")
	return candidates, "", true
}

// maxShownModel bounds a model name as the access log and traces show it: a forwarded name is
// the client's own, of any length up to --max-payload-size.
const maxShownModel = 256
