// Package vllmcompat holds no code, only a test suite: cacheroute run as a user of the vLLM router
// runs it. The router is started through the command line (cli.Execute) with the command lines
// the vLLM router's launcher writes, including the flags that have no effect here, in front of
// mock workers written in the style of that project's fixtures (httptest servers on loopback
// that list the model "mock" while the requests name others, answer with their id, and can be
// slowed, failed, held or asked what they received); the tests then check, over real HTTP, the
// behaviour its integration tests check: cache-aware affinity and balance, power-of-two load
// balancing, prefill/decode disaggregation with bootstrap ports and per-role data parallelism,
// concurrency limits with a queue, its 429s and 408s.
package vllmcompat
