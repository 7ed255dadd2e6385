{{/*
Names and labels shared by the templates. Object names are those of
manifests/base with .Values.namePrefix in front (kustomize's namePrefix).
*/}}

{{/* The namespace of every namespaced object: namespace.name, else the release's. */}}
{{- define "my-controller.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* An object's name: the prefix, then the manifests' name (the argument). */}}
{{- define "my-controller.name" -}}
{{- printf "%s%s" .root.Values.namePrefix .name -}}
{{- end -}}

{{/*
The labels manifests/ gives every object, then Helm's own. Selectors use only
name and component, as manifests/ does, so they never change on an upgrade.
*/}}
{{- define "my-controller.labels" -}}
app.kubernetes.io/name: my-controller
app.kubernetes.io/part-of: my-controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "my-controller.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* /metrics: the container port's number and name, plain or secure. */}}
{{- define "my-controller.metricsPort" -}}
{{- if .Values.metrics.secure }}8443{{ else }}8080{{ end -}}
{{- end -}}
{{- define "my-controller.metricsPortName" -}}
{{- if .Values.metrics.secure }}https{{ else }}metrics{{ end -}}
{{- end -}}

{{/* Values that cannot work, refused before anything is applied. */}}
{{- define "my-controller.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) (not .Values.sharding.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled (standbys) or sharding.enabled (each replica its share): without either every replica reconciles the same My at once" -}}
{{- end -}}
{{- if and .Values.namespace.create (eq (include "my-controller.namespace" .) .Release.Namespace) -}}
{{- fail (printf "namespace.create makes the Namespace %q, but Helm keeps the release there and needs it first: install the release in another namespace (-n), or set namespace.create=false" .Release.Namespace) -}}
{{- end -}}
{{- end -}}
