{{/*
The chart's name (nameOverride replaces it).
*/}}
{{- define "mcs.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's base name, the prefix of every resource: fullnameOverride, or the release
name when it contains the chart's name (release "mcs" gives mcs-agent, mcs-dns, ...), or
"<release>-<chart>". At most 42 characters, so that the longest suffix
("-hub-member-discovery") still fits in 63.
*/}}
{{- define "mcs.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
chart-version, for the helm.sh/chart label.
*/}}
{{- define "mcs.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels that select this release's pods.
*/}}
{{- define "mcs.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcs.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The standard labels of every resource.
*/}}
{{- define "mcs.labels" -}}
helm.sh/chart: {{ include "mcs.chart" . }}
{{ include "mcs.selectorLabels" . }}
app.kubernetes.io/version: {{ include "mcs.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mcs
{{- end }}

{{/*
The image tag: image.tag, or the chart's appVersion.
*/}}
{{- define "mcs.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion | trunc 63 }}
{{- end }}

{{/*
The one image holding both binaries.
*/}}
{{- define "mcs.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Names of the components' resources.
*/}}
{{- define "mcs.agent.fullname" -}}
{{- printf "%s-agent" (include "mcs.fullname" .) }}
{{- end }}

{{- define "mcs.dns.fullname" -}}
{{- printf "%s-dns" (include "mcs.fullname" .) }}
{{- end }}

{{- define "mcs.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "mcs.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "mcs.dns.serviceAccountName" -}}
{{- if .Values.dns.serviceAccount.create }}
{{- default (include "mcs.dns.fullname" .) .Values.dns.serviceAccount.name }}
{{- else }}
{{- required "dns.serviceAccount.name is required when dns.serviceAccount.create is false" .Values.dns.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The name this cluster has as a mesh member: agent.mesh.self, else clusterId.
*/}}
{{- define "mcs.agent.meshSelf" -}}
{{- $self := .Values.agent.mesh.self | default .Values.clusterId }}
{{- if not $self }}
{{- fail "agent.mode=mesh needs this cluster's member name: set clusterId (passed as --cluster-id) or agent.mesh.self (the agent then reads its id from the ClusterProperty cluster.clusterset.k8s.io and checks that it is this name)" }}
{{- end }}
{{- if and .Values.clusterId .Values.agent.mesh.self (ne .Values.clusterId .Values.agent.mesh.self) }}
{{- fail (printf "agent.mesh.self (%s) differs from clusterId (%s): the agent's own cluster must be one of its members" .Values.agent.mesh.self .Values.clusterId) }}
{{- end }}
{{- $self }}
{{- end }}

{{/*
A member's namespace on the hub, as mcs_kube::hub::member_namespace computes it:
mcs-member-<id> for ids of up to 52 characters, else the id's first 43 characters (trailing
"-" removed), "-" and the first 8 hex digits of the id's SHA-256.
*/}}
{{- define "mcs.hub.memberNamespace" -}}
{{- if le (len .) 52 }}
{{- printf "mcs-member-%s" . }}
{{- else }}
{{- printf "mcs-member-%s-%s" (regexReplaceAll "-+$" (substr 0 43 .) "") (sha256sum . | trunc 8) }}
{{- end }}
{{- end }}

{{/*
The pod-level securityContext of both Deployments.
*/}}
{{- define "mcs.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The container-level securityContext of both Deployments.
*/}}
{{- define "mcs.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/*
The probes on the admin port (/healthz, /readyz).
*/}}
{{- define "mcs.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 2
{{- end }}

{{/*
The CoreDNS server block forwarding the ClusterSet zone to the mcs-dns Service; the
argument is the address to forward to.
*/}}
{{- define "mcs.corednsServerBlock" -}}
{{ .zone }}:53 {
    errors
    cache {{ .cache }}
    forward . {{ .address }}
}
{{- end }}
