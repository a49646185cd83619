package tenant

import "log/slog"

// ID is a worker tenant's one identity inside the router: the normalised worker URL, or
// "URL@rank" with data parallelism (Name). The prefix tree, the KV-event index, the session
// store, residency and the TTFT predictor all key a worker by it, so that one worker is one key
// everywhere. A defined string, it costs nothing to compare, hash or keep beside a string.
//
// Like URL, it keeps the URL's userinfo, so that two workers told apart only by their
// credentials stay two workers; and like URL it crosses a boundary in one of two forms, chosen
// there: string(id) where the router's own state is kept (the shared session store, whose values
// earlier releases wrote in this form, and the consistent-hash ring), and Redacted where anyone
// may see it (headers, metric labels, logs, status pages). log/slog writes it redacted by itself
// (LogValue).
type ID string

// IDOf is the ID of url's tenant at rank (Name).
func IDOf(url string, rank int) ID { return ID(Name(url, rank)) }

// Redacted is the ID without its URL's user:password@ (Redact), the only form shown outside the
// router.
func (id ID) Redacted() string { return Redact(string(id)) }

// LogValue makes log/slog write the ID redacted, so that an ID logged as it is shows no
// credentials.
func (id ID) LogValue() slog.Value { return slog.StringValue(id.Redacted()) }
