// Package kubeapi is the little of the Kubernetes API that discovery needs, over net/http: how
// to reach and authenticate to the API server (in-cluster service account or a kubeconfig file),
// and a list and a watch of the pods of one namespace that match an equality-based label
// selector. It decodes only the fields of a pod that discovery reads, so nothing else of a pod
// is held, and it links none of client-go.
package kubeapi
