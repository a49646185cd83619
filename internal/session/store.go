// Package session maps each conversation's session key to the worker tenant that served it,
// per model, so follow-up turns of a conversation return to the worker that holds its KV
// cache. Store is the interface the routing policy uses; Memory is the in-process
// implementation, and a shared Redis implementation can satisfy the same interface.
package session

import (
	"context"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// Store maps (model, session key) → worker, by its tenant.ID such as "http://10.0.0.1:8000" or
// "http://10.0.0.1:8000@3" (data-parallel rank 3).
type Store interface {
	// Get returns the worker for key and refreshes the entry's access time (and TTL).
	Get(ctx context.Context, model, key string) (worker tenant.ID, ok bool, err error)
	// Set points key at worker (insert or overwrite), resetting its TTL.
	Set(ctx context.Context, model, key string, worker tenant.ID) error
	// Delete removes key; deleting a missing key is not an error.
	Delete(ctx context.Context, model, key string) error
	// RemoveTenantsWithBase drops every entry pointing at base or base+"@<rank>" (a removed
	// worker together with all its data-parallel ranks), in every model.
	RemoveTenantsWithBase(ctx context.Context, base string) error
}

// EvictReason says why entries left the store without being deleted by the caller; it is
// meant as a bounded metric label (see String).
type EvictReason int

const (
	// SessionTTL: the entry was not used for longer than the TTL.
	SessionTTL EvictReason = iota + 1
	// SessionCapacity: the store was full and this was its least recently used entry, of any
	// model; it is reported under the model it belonged to.
	SessionCapacity
	// WorkerRemoved: the entry pointed at a worker that was removed from the pool.
	WorkerRemoved
)

// String returns the reason as a metric label value.
func (r EvictReason) String() string {
	switch r {
	case SessionTTL:
		return "session_ttl"
	case SessionCapacity:
		return "session_capacity"
	case WorkerRemoved:
		return "worker_removed"
	}
	return "unknown"
}
