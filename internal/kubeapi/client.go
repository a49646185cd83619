package kubeapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Timeouts of the connection to the API server. A watch has none for its whole length: the
// server ends it after the timeoutSeconds it was asked for.
const (
	dialTimeout    = 10 * time.Second
	headerTimeout  = 30 * time.Second // the server's headers, for a list and a watch alike
	listTimeout    = time.Minute      // one page of a list, body included
	maxErrorBody   = 64 << 10         // of a refusal's Status, read for its message
	userAgent      = "cacheroute"
	listPageLength = 500
)

// Client lists and watches pods on one API server.
type Client struct {
	base *url.URL
	cfg  Config
	http *http.Client
}

// New checks cfg and returns a client; it does not contact the server.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.Server)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("kubeapi: server %q is not an http(s) URL", cfg.Server)
	}
	proxy := cfg.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	t := &http.Transport{
		Proxy:                 proxy,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       cfg.TLS,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: headerTimeout,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   2,
		ForceAttemptHTTP2:     true,
	}
	return &Client{base: u, cfg: cfg, http: &http.Client{Transport: t}}, nil
}

// Server is the base URL of the API server.
func (c *Client) Server() string { return c.base.String() }

// ListPods reads one page (at most 500 pods) of the pods of ns matching sel, from the page named
// by cont ("" for the first). A list's resource version is where a watch of it starts.
func (c *Client) ListPods(ctx context.Context, ns string, sel Selector, cont string) (*PodList, error) {
	q := url.Values{"labelSelector": {sel.String()}, "limit": {strconv.Itoa(listPageLength)}}
	if cont != "" {
		q.Set("continue", cont)
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := c.get(ctx, ns, q)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list PodList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("kubeapi: list of pods: %w", err)
	}
	return &list, nil
}

// EventType is the type of a watch event.
type EventType string

// The event types of a watch.
const (
	Added    EventType = "ADDED"
	Modified EventType = "MODIFIED"
	Deleted  EventType = "DELETED"
	Bookmark EventType = "BOOKMARK" // only a resource version: nothing changed up to it
	Error    EventType = "ERROR"    // a Status; the watch ends after it
)

// Event is one event of a watch. Pod is set for every type but Error, for which Err is.
type Event struct {
	Type EventType
	Pod  Pod
	Err  *StatusError
}

// Watch is an open watch; Next reads its events until the server ends it.
type Watch struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// WatchPods watches the pods of ns matching sel from resource version rv, with bookmarks, for
// at most timeout (the server ends the watch then, and the caller watches again from the last
// version it saw).
func (c *Client) WatchPods(ctx context.Context, ns string, sel Selector, rv string, timeout time.Duration) (*Watch, error) {
	q := url.Values{
		"labelSelector":       {sel.String()},
		"watch":               {"true"},
		"resourceVersion":     {rv},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {strconv.Itoa(int(timeout / time.Second))},
	}
	resp, err := c.get(ctx, ns, q)
	if err != nil {
		return nil, err
	}
	return &Watch{body: resp.Body, dec: json.NewDecoder(bufio.NewReader(resp.Body))}, nil
}

// Next is the next event; io.EOF when the server ended the watch in order.
func (w *Watch) Next() (Event, error) {
	var raw struct {
		Type   EventType       `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	if err := w.dec.Decode(&raw); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Event{}, fmt.Errorf("kubeapi: watch cut: %w", err)
		}
		return Event{}, err
	}
	ev := Event{Type: raw.Type}
	switch raw.Type {
	case Added, Modified, Deleted, Bookmark:
		if err := json.Unmarshal(raw.Object, &ev.Pod); err != nil {
			return Event{}, fmt.Errorf("kubeapi: %s event: %w", raw.Type, err)
		}
	case Error:
		var st Status
		if err := json.Unmarshal(raw.Object, &st); err != nil {
			return Event{}, fmt.Errorf("kubeapi: ERROR event: %w", err)
		}
		ev.Err = &StatusError{Status: st}
	default:
		return Event{}, fmt.Errorf("kubeapi: watch event of unknown type %q", raw.Type)
	}
	return ev, nil
}

// Close ends the watch.
func (w *Watch) Close() error { return w.body.Close() }

// get sends GET /api/v1/namespaces/{ns}/pods?q with the credentials and returns a 200 response;
// any other status is a *StatusError with the server's message.
func (c *Client) get(ctx context.Context, ns string, q url.Values) (*http.Response, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/namespaces/" + url.PathEscape(ns) + "/pods"
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", userAgent)
	if c.cfg.Token != nil {
		token, err := c.cfg.Token()
		if err != nil {
			return nil, fmt.Errorf("kubeapi: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
	} else if c.cfg.Username != "" {
		req.SetBasicAuth(c.cfg.Username, c.cfg.Password)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	st := Status{Code: resp.StatusCode}
	if json.Unmarshal(b, &st) != nil || st.Message == "" {
		st.Message = strings.TrimSpace(string(b))
		if st.Message == "" {
			st.Message = http.StatusText(resp.StatusCode)
		}
	}
	if st.Code == 0 {
		st.Code = resp.StatusCode
	}
	return nil, &StatusError{Status: st}
}
