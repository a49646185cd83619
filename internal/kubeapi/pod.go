package kubeapi

import (
	"errors"
	"fmt"
)

// Pod is what discovery reads of a pod; the decoder drops every other field as it reads.
type Pod struct {
	Metadata struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		UID               string            `json:"uid,omitempty"`
		ResourceVersion   string            `json:"resourceVersion,omitempty"`
		Labels            map[string]string `json:"labels,omitempty"`
		Annotations       map[string]string `json:"annotations,omitempty"`
		DeletionTimestamp *string           `json:"deletionTimestamp,omitempty"`
	} `json:"metadata"`
	Status PodStatus `json:"status"`
}

// PodStatus is the part of a pod's status that says whether and where it serves.
type PodStatus struct {
	Phase      string         `json:"phase,omitempty"` // Pending, Running, Succeeded, Failed, Unknown
	PodIP      string         `json:"podIP,omitempty"`
	Conditions []PodCondition `json:"conditions,omitempty"`
}

// PodCondition is one entry of a pod's status conditions ("Ready", "True").
type PodCondition struct {
	Type   string `json:"type"`
	Status string `json:"status"`
}

// Ready reports whether the pod's Ready condition is True; a pod without one is not ready.
func (p *Pod) Ready() bool {
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			ready = c.Status == "True"
		}
	}
	return ready
}

// Finished reports whether the pod's containers have ended for good (phase Succeeded or Failed).
func (p *Pod) Finished() bool {
	return p.Status.Phase == "Succeeded" || p.Status.Phase == "Failed"
}

// PodList is one page of a list of pods.
type PodList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue,omitempty"`
	} `json:"metadata"`
	Items []Pod `json:"items"`
}

// Status is the API server's answer to a request it refused, and the object of a watch's ERROR
// event.
type Status struct {
	Kind    string `json:"kind,omitempty"`
	Status  string `json:"status,omitempty"`
	Code    int    `json:"code"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// StatusError is a Status as an error.
type StatusError struct{ Status Status }

func (e *StatusError) Error() string {
	msg := e.Status.Message
	if msg == "" {
		msg = e.Status.Reason
	}
	return fmt.Sprintf("the API server answered %d: %s", e.Status.Code, msg)
}

// IsGone reports whether err says that the resource version asked for is older than what the
// API server still holds (410 Gone, reason Expired): the caller must list again.
func IsGone(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status.Code == 410
}
