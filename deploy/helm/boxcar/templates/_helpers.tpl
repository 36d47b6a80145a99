{{/* The release's base name, at most 63 characters; a release named like the chart keeps one copy. */}}
{{- define "boxcar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "boxcar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "boxcar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: boxcar
{{- end -}}

{{- define "boxcar.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "boxcar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "boxcar.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/*
The labels the kubernetes sandbox backend puts on every sandbox pod
(internal/sandbox/kubernetes.go: LabelManagedBy, LabelComponent). The NetworkPolicy selects
them; deploy/helm/chart_test.go holds the two to each other.
*/}}
{{- define "boxcar.sandboxSelectorLabels" -}}
app.kubernetes.io/managed-by: boxcar
app.kubernetes.io/component: sandbox
{{- end -}}

{{/* The worker configuration: the operator's config plus what the chart decides. */}}
{{- define "boxcar.workerConfig" -}}
{{- $chart := dict
  "metrics_addr" (printf ":%d" (int .Values.metrics.port))
  "drain_grace" (printf "%ds" (int .Values.drainGraceSeconds))
  "sandbox" (dict "backend" "kubernetes" "kubernetes" (dict "namespace" .Values.sandboxes.namespace "image_pull_policy" .Values.sandboxes.imagePullPolicy))
-}}
{{- toYaml (merge $chart (deepCopy .Values.config)) -}}
{{- end -}}

{{/* Selector that scopes alert and dashboard queries to this release's workers. */}}
{{- define "boxcar.promSelector" -}}
namespace="{{ .Release.Namespace }}",service="{{ include "boxcar.fullname" . }}-metrics"
{{- end -}}

{{- define "boxcar.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
