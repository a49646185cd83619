package workers

import "fmt"

// Role is the part of a request a worker takes under prefill/decode disaggregation: the whole
// request (colocated, the default), only the prompt's prefill, or the decode that continues
// from a prefill worker's KV cache.
type Role uint8

const (
	RoleColocated Role = iota
	RolePrefill
	RoleDecode
)

// roleNames are the roles as flags, the admin API and metrics spell them.
var roleNames = [...]string{RoleColocated: "colocated", RolePrefill: "prefill", RoleDecode: "decode"}

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", r)
}

// ParseRole reads a role by its name; "" is colocated.
func ParseRole(s string) (Role, error) {
	if s == "" {
		return RoleColocated, nil
	}
	for r, name := range roleNames {
		if s == name {
			return Role(r), nil
		}
	}
	return 0, fmt.Errorf("role %q is not one of colocated, prefill, decode", s)
}

// Role is the worker's role.
func (w *Worker) Role() Role { return Role(w.role.Load()) }

// SetRole sets the worker's role; a worker joins colocated.
func (w *Worker) SetRole(r Role) { w.role.Store(uint32(r)) }

// OfRole returns the workers of ws that have role r, in order.
func OfRole(ws []*Worker, r Role) []*Worker {
	var out []*Worker
	for _, w := range ws {
		if w.Role() == r {
			out = append(out, w)
		}
	}
	return out
}
