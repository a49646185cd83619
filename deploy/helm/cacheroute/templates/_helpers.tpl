{{/* Names and labels. */}}
{{- define "cacheroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cacheroute.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cacheroute.redisName" -}}
{{- printf "%s-redis" (include "cacheroute.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cacheroute.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cacheroute
{{- end }}

{{/* The router pods' selector labels. */}}
{{- define "cacheroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cacheroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{/* The labels of the metrics Service, which the ServiceMonitor selects. */}}
{{- define "cacheroute.metricsLabels" -}}
app.kubernetes.io/name: {{ include "cacheroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: metrics
{{- end }}

{{/* The bundled Redis pod's selector labels. */}}
{{- define "cacheroute.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "cacheroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: session-store
{{- end }}

{{- define "cacheroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cacheroute.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cacheroute.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "cacheroute.discoveryNamespace" -}}
{{- default .Release.Namespace .Values.discovery.namespace }}
{{- end }}

{{/* true when the chart runs its own Redis. */}}
{{- define "cacheroute.bundledRedis" -}}
{{- if and (eq .Values.sessionStore.type "redis") (not .Values.sessionStore.existingSecret) }}true{{ end }}
{{- end }}

{{- define "cacheroute.scheme" -}}
{{- if .Values.tls.existingSecret }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* Where the mounted Secrets are read. */}}
{{- define "cacheroute.clientKeysFile" -}}
/etc/cacheroute/client-keys/{{ .Values.clientKeys.existingSecretKey }}
{{- end }}

{{/*
cacheroute.validate fails the rendering on values the router would refuse, or that would leave a
hole: an admin API without its key, a router with no way to find workers.
*/}}
{{- define "cacheroute.validate" -}}
{{- if and .Values.admin.enabled (not .Values.admin.existingSecret) }}
{{- fail "admin.enabled needs admin.existingSecret: the name of a Secret holding the admin API key (kubectl create secret generic cacheroute-admin --from-literal=api-key=\"$(openssl rand -hex 32)\"). An admin API without a key would let anyone who reaches it register workers and read prompts." }}
{{- end }}
{{- if and .Values.admin.enabled (not .Values.admin.existingSecretKey) }}
{{- fail "admin.existingSecretKey must name the Secret's key that holds the admin API key" }}
{{- end }}
{{- if not (has .Values.sessionStore.type (list "memory" "redis")) }}
{{- fail (printf "sessionStore.type must be memory or redis, got %q" .Values.sessionStore.type) }}
{{- end }}
{{- if and .Values.discovery.enabled (empty .Values.discovery.selector) (empty .Values.discovery.prefillSelector) (empty .Values.discovery.decodeSelector) }}
{{- fail "discovery.selector must name at least one label of the worker pods (or give discovery.prefillSelector or discovery.decodeSelector): an empty selector would match every pod of the namespace, the router's own among them" }}
{{- end }}
{{- if and (not .Values.discovery.enabled) (empty .Values.workerUrls) (not (index .Values.config "allow_empty")) (not (index .Values.config "dns_discovery")) }}
{{- fail "no workers: set discovery.enabled with discovery.selector, or list workerUrls (or config.dns_discovery, or config.allow_empty with the admin API)" }}
{{- end }}
{{- $managed := list "host" "port" "prometheus_host" "prometheus_port" "worker_urls" "intra_node_data_parallel_size" "policy" "cache_threshold" "balance_abs_threshold" "balance_rel_threshold" "max_tree_size" "eviction_interval_secs" "session_ttl" "max_sessions" "session_store" "redis_url" "redis_key_prefix" "redis_timeout" "api_key" "admin_api_key" "client_api_keys_file" "tls_cert_file" "tls_key_file" "service_discovery" "selector" "prefill_selector" "decode_selector" "service_discovery_port" "service_discovery_namespace" "kubeconfig" }}
{{- range $key, $_ := .Values.config }}
{{- if has $key $managed }}
{{- fail (printf "config.%s is set by the chart from its own values (see values.yaml); secrets come from Secrets, never from config" $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The router's router.yaml: the chart's values, then config. */}}
{{- define "cacheroute.routerConfig" -}}
{{- $c := dict
  "host" "0.0.0.0"
  "port" 30000
  "prometheus_host" "0.0.0.0"
  "prometheus_port" 29000
  "policy" .Values.policy.name
  "cache_threshold" .Values.policy.cacheThreshold
  "balance_abs_threshold" .Values.policy.balanceAbsThreshold
  "balance_rel_threshold" .Values.policy.balanceRelThreshold
  "max_tree_size" .Values.policy.maxTreeSize
  "eviction_interval_secs" .Values.policy.evictionIntervalSecs
  "session_ttl" .Values.policy.sessionTtl
  "max_sessions" .Values.policy.maxSessions
  "intra_node_data_parallel_size" .Values.dataParallelSize
  "session_store" .Values.sessionStore.type
}}
{{- if .Values.workerUrls }}
{{- $_ := set $c "worker_urls" .Values.workerUrls }}
{{- end }}
{{- if .Values.discovery.enabled }}
{{- $_ := set $c "service_discovery" true }}
{{- if .Values.discovery.selector }}
{{- $_ := set $c "selector" .Values.discovery.selector }}
{{- end }}
{{- if .Values.discovery.prefillSelector }}
{{- $_ := set $c "prefill_selector" .Values.discovery.prefillSelector }}
{{- end }}
{{- if .Values.discovery.decodeSelector }}
{{- $_ := set $c "decode_selector" .Values.discovery.decodeSelector }}
{{- end }}
{{- $_ := set $c "service_discovery_port" .Values.discovery.port }}
{{- $_ := set $c "service_discovery_namespace" (include "cacheroute.discoveryNamespace" .) }}
{{- end }}
{{- if eq .Values.sessionStore.type "redis" }}
{{- $_ := set $c "redis_key_prefix" .Values.sessionStore.keyPrefix }}
{{- $_ := set $c "redis_timeout" .Values.sessionStore.timeout }}
{{- end }}
{{- if .Values.clientKeys.existingSecret }}
{{- $_ := set $c "client_api_keys_file" (include "cacheroute.clientKeysFile" .) }}
{{- end }}
{{- if .Values.tls.existingSecret }}
{{- $_ := set $c "tls_cert_file" "/etc/cacheroute/tls/tls.crt" }}
{{- $_ := set $c "tls_key_file" "/etc/cacheroute/tls/tls.key" }}
{{- end }}
{{- toYaml (merge $c .Values.config) }}
{{- end }}
