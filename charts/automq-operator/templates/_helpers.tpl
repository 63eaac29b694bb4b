{{/*
Names and labels shared by every template. The fullname is the release name when it already
contains the chart name (`helm install automq-operator ...` gives "automq-operator").
*/}}
{{- define "automq-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "automq-operator.fullname" -}}
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

{{- define "automq-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "automq-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "automq-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "automq-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: automq
{{- end }}

{{- define "automq-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "automq-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "automq-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* OPERATOR_RULES from automq.operator.rbac, split by scope (scripts/sync-k8s-artifacts.py). */}}
{{- define "automq-operator.rules" -}}
{{- .Files.Get "files/operator-rules.yaml" }}
{{- end }}

{{/* The namespace the optional AutoMQCluster lives in. */}}
{{- define "automq-operator.clusterNamespace" -}}
{{- default .Release.Namespace .Values.cluster.namespace }}
{{- end }}
