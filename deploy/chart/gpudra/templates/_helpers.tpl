{{/* Names, labels and the settings every gpudra container shares. */}}

{{- define "gpudra.fullname" -}}
{{- if contains "gpudra" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-gpudra" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpudra.labels" -}}
app.kubernetes.io/name: gpudra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include with (list $ "component"). */}}
{{- define "gpudra.selector" -}}
app.kubernetes.io/name: gpudra
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpudra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* What clients connect to: nats.url, else the chart's NATS Service. */}}
{{- define "gpudra.natsUrl" -}}
{{- if .Values.nats.url -}}
{{- .Values.nats.url -}}
{{- else if .Values.nats.enabled -}}
tls://{{ include "gpudra.fullname" . }}-nats.{{ .Release.Namespace }}.svc:{{ int .Values.nats.ports.client }}
{{- else -}}
{{- required "nats.url is required when nats.enabled is false" .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{/* Every pod of the chart on the node's network (hostNetwork), resolving cluster
names all the same; nothing otherwise. Include with: with include ... | nindent 6. */}}
{{- define "gpudra.podNetwork" -}}
{{- if .Values.hostNetwork -}}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end -}}
{{- end -}}

{{/* Where a container that calls the API server finds it, when not at the in-cluster
Service the kubelet names (KUBERNETES_SERVICE_HOST/PORT): apiServer.host and .port. */}}
{{- define "gpudra.apiServerEnv" -}}
{{- with .Values.apiServer.host -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ required "apiServer.port is required with apiServer.host" $.Values.apiServer.port | quote }}
{{- end -}}
{{- end -}}

{{/* featureGates as the flag value: Name=true,Other=false (sorted by name). */}}
{{- define "gpudra.featureGates" -}}
{{- $gates := list -}}
{{- range $name, $on := .Values.featureGates -}}
{{- $gates = append $gates (printf "%s=%t" $name $on) -}}
{{- end -}}
{{- join "," $gates -}}
{{- end -}}

{{/* Where the bus is and what its streams keep: every bus client, the provision Job
included (services/core/process/config.py add_nats_flags, --nats-replicas; the retention
variables of services/core/bus/retention.py). The bus token and CA are files of the
container's own volume (gpudra.natsVolume). */}}
{{- define "gpudra.busEnv" -}}
- name: GPUDRA_NATS_URL
  value: {{ include "gpudra.natsUrl" . | quote }}
- name: GPUDRA_NATS_TOKEN_FILE
  value: /var/run/gpudra/nats/token
- name: GPUDRA_NATS_CA
  value: /var/run/gpudra/nats/ca.crt
- name: GPUDRA_NATS_REPLICAS
  value: {{ ternary .Values.nats.replicas .Values.nats.streamReplicas .Values.nats.enabled | quote }}
{{- range $name, $limits := .Values.retention }}
{{- range $setting, $value := $limits }}
- name: {{ printf "GPUDRA_%s_%s" ($name | upper) ($setting | snakecase | upper) }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The common flags every service takes (services/core/process/config.py add_common_flags). */}}
{{- define "gpudra.commonEnv" -}}
{{ include "gpudra.busEnv" . }}
- name: GPUDRA_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: GPUDRA_FEATURE_GATES
  value: {{ include "gpudra.featureGates" . | quote }}
- name: GPUDRA_CONSUMABLE_SHARES
  value: {{ .Values.consumableShares | default "disabled" | quote }}
- name: GPUDRA_MAX_INFLIGHT
  value: {{ .Values.maxInflight | quote }}
{{- end -}}

{{/* The node's name for the node services (config.default_node_name reads NODE_NAME). */}}
{{- define "gpudra.nodeNameEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end -}}


{{/* The bus credentials of one container: include with (list $ "role") in volumes.
A projected ServiceAccount token whose audience names the role (the auth callout
asks the API server to confirm it for exactly that audience) and the CA that
signed the NATS servers' certificate, nothing else of the TLS Secret. */}}
{{- define "gpudra.natsVolume" -}}
{{- $ := index . 0 -}}
- name: nats-{{ index . 1 }}
  projected:
    sources:
      - serviceAccountToken:
          path: token
          audience: {{ printf "%s:%s" $.Values.nats.auth.audience (index . 1) }}
          expirationSeconds: {{ int $.Values.nats.auth.tokenExpirationSeconds }}
      - secret:
          name: {{ include "gpudra.fullname" $ }}-nats-tls
          items:
            - key: ca.crt
              path: ca.crt
{{- end -}}

{{/* Where a container finds its bus credentials: include with (list $ "role"). */}}
{{- define "gpudra.natsMount" -}}
- name: nats-{{ index . 1 }}
  mountPath: /var/run/gpudra/nats
  readOnly: true
{{- end -}}

{{/* The ServiceAccount each bus role's pod runs as, for the auth callout's grants (the
IMEX daemons' account, with ComputeDomains: their pods are the controller's, not the chart's). */}}
{{- define "gpudra.natsGrants" -}}
{{- $full := include "gpudra.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $grants := list -}}
{{- range $role, $account := dict "discovery" "preparer" "preparer" "preparer" "kubeletplugin" "preparer" "publisher" "publisher" "allocator" "allocator" "domains" "domains" "admin" "provision" -}}
{{- $grants = append $grants (printf "%s=%s/%s-%s" $role $ns $full $account) -}}
{{- end -}}
{{- if .Values.computeDomains.enabled -}}
{{- $grants = append $grants (printf "imex-daemon=%s/compute-domain-daemon-service-account" $ns) -}}
{{- end -}}
{{- join "," $grants -}}
{{- end -}}

{{/* Metrics and tracing of one component: (list . "<component>"). POD_NAME names the
process in claim events (its "instance"). */}}
{{- define "gpudra.observabilityEnv" -}}
{{- $root := index . 0 }}{{ $component := index . 1 -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if $root.Values.metrics.enabled }}
- name: GPUDRA_METRICS_PORT
  value: {{ index $root.Values.metrics.ports $component | quote }}
- name: GPUDRA_METRICS_ADDRESS
  value: {{ $root.Values.metrics.address | quote }}
{{- end }}
{{- with $root.Values.otlp }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
- name: OTEL_EXPORTER_OTLP_INSECURE
  value: {{ .insecure | quote }}
{{- if .certificate }}
- name: OTEL_EXPORTER_OTLP_CERTIFICATE
  value: {{ .certificate | quote }}
{{- end }}
{{- if .headersSecret }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .headersSecret }}
      key: headers
{{- end }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplerArg | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ printf "gpudra-%s" $component | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The metrics port of one component: (list . "<component>"). */}}
{{- define "gpudra.metricsPort" -}}
{{- $root := index . 0 }}{{ $component := index . 1 -}}
{{- if $root.Values.metrics.enabled -}}
ports:
  - name: {{ printf "metrics-%s" $component | trunc 15 }}
    containerPort: {{ index $root.Values.metrics.ports $component }}
    protocol: TCP
{{- end }}
{{- end -}}

{{/* prometheus.io annotations for a pod with one metrics port: (list . "<component>"). */}}
{{- define "gpudra.scrapeAnnotations" -}}
{{- $root := index . 0 }}{{ $component := index . 1 -}}
{{- if and $root.Values.metrics.enabled $root.Values.metrics.annotations -}}
annotations:
  prometheus.io/scrape: "true"
  prometheus.io/port: {{ index $root.Values.metrics.ports $component | quote }}
  prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/*
Claim status writes that are safe only where the API server authorizes them per driver
and node (Kubernetes 1.36+, resourceclaims/driver): "on" or "off", from a value that is
on, off or auto (auto: on from 1.36). The chart grants the RBAC and the binaries get the
same answer, so they never disagree. (list $ value)
*/}}
{{- define "gpudra.claimStatusWrites" -}}
{{- $root := index . 0 -}}
{{- $value := index . 1 | toString -}}
{{- if or (eq $value "on") (and (eq $value "auto") (semverCompare ">=1.36-0" $root.Capabilities.KubeVersion.Version)) -}}
on
{{- else -}}
off
{{- end -}}
{{- end }}
