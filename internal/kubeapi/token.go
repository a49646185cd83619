package kubeapi

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// tokenRecheck is how long a token read from a file is used before the file is read again even
// though its size and modification time have not changed (a rewrite within one timestamp tick).
const tokenRecheck = time.Minute

// fileToken is a bearer token kept in a file that is replaced while the process runs, as the
// kubelet does with a projected service account token (it renames a new one into place well
// before the old one expires). The file is looked at before each request and read again when it
// has changed, or a minute after it was last read.
type fileToken struct {
	path string

	mu    sync.Mutex
	token string
	mod   time.Time
	size  int64
	read  time.Time
}

func newFileToken(path string) *fileToken { return &fileToken{path: path} }

func (f *fileToken) get() (string, error) {
	st, err := os.Stat(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if f.token != "" {
			return f.token, nil // being replaced, or gone for a moment: the last one may still do
		}
		return "", fmt.Errorf("token: %w", err)
	}
	if f.token != "" && st.ModTime().Equal(f.mod) && st.Size() == f.size && time.Since(f.read) < tokenRecheck {
		return f.token, nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		if f.token != "" {
			return f.token, nil
		}
		return "", fmt.Errorf("token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		if f.token != "" {
			return f.token, nil
		}
		return "", errors.New("token: " + f.path + " is empty")
	}
	f.token, f.mod, f.size, f.read = t, st.ModTime(), st.Size(), time.Now()
	return t, nil
}
