{{/*
Names. Every object is prefixed with the release name (the ModelOrchestra
name, at most 40 characters). Per-application names are
"<release>-<app>", shortened to 40 characters with a stable hash suffix
when longer, so that "<name>-worker-g<replica>" stays within the 52
characters a StatefulSet name may have.
*/}}
{{- define "mo.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "mo.appFullname" -}}
{{- $name := printf "%s-%s" (include "mo.fullname" .root) .app -}}
{{- if gt (len $name) 40 -}}
{{- printf "%s-%s" ($name | trunc 33 | trimSuffix "-") ($name | sha256sum | trunc 6) -}}
{{- else -}}
{{- $name -}}
{{- end -}}
{{- end -}}

{{/* Labels common to every object. */}}
{{- define "mo.labels" -}}
app.kubernetes.io/name: modelorchestra
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/part-of: modelorchestra
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
{{- end -}}

{{/* Selector labels of one component: dict "root" $ "component" "gateway". */}}
{{- define "mo.selectorLabels" -}}
app.kubernetes.io/name: modelorchestra
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Selector labels of one application's component:
dict "root" $ "app" $name "component" "root". */}}
{{- define "mo.appSelectorLabels" -}}
{{ include "mo.selectorLabels" . }}
modelorchestra.io/application: {{ .app | quote }}
{{- end -}}

{{/* Pod security context of our own images (restricted Pod Security). */}}
{{- define "mo.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context of our own images (restricted Pod Security). */}}
{{- define "mo.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "mo.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ .name | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The in-cluster NATS client URL, or the external one. */}}
{{- define "mo.natsURL" -}}
{{- if .Values.global.nats.url -}}
{{- .Values.global.nats.url -}}
{{- else -}}
{{- printf "nats://%s-nats.%s.svc:4222" (include "mo.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
NATS client wiring of a container: the environment every NATS client reads.
The nats-wiring post-renderer rewrites it from the resource, so that every
component uses one resolved URL and one set of credentials.
*/}}
{{- define "mo.natsEnv" -}}
- name: NATS_URL
  value: {{ include "mo.natsURL" . | quote }}
- name: NATS_STREAM_REPLICAS
  value: {{ .Values.global.nats.replicas | quote }}
{{- if and .Values.global.nats.url .Values.global.nats.credentialsSecret }}
- name: NATS_CREDENTIALS_DIR
  value: /etc/orchestra/nats
{{- end }}
{{- end -}}

{{- define "mo.natsVolumeMounts" -}}
{{- if and .Values.global.nats.url .Values.global.nats.credentialsSecret }}
- name: nats-credentials
  mountPath: /etc/orchestra/nats
  readOnly: true
{{- end }}
{{- end -}}

{{- define "mo.natsVolumes" -}}
{{- if and .Values.global.nats.url .Values.global.nats.credentialsSecret }}
- name: nats-credentials
  secret:
    secretName: {{ .Values.global.nats.credentialsSecret | quote }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* The claim holding an application's model, and the sub path in it. */}}
{{- define "mo.modelClaim" -}}
{{- $m := .spec.model -}}
{{- if hasPrefix "pvc://" $m.source -}}
{{- (splitList "/" (trimPrefix "pvc://" $m.source)) | first -}}
{{- else if and $m.cache $m.cache.existingClaim -}}
{{- $m.cache.existingClaim -}}
{{- else -}}
{{- printf "%s-model" (include "mo.appFullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "mo.modelSubPath" -}}
{{- $m := .spec.model -}}
{{- if hasPrefix "pvc://" $m.source -}}
{{- rest (splitList "/" (trimPrefix "pvc://" $m.source)) | join "/" -}}
{{- end -}}
{{- end -}}

{{/* Resources, or the given defaults when none are set. */}}
{{- define "mo.resources" -}}
{{- if .resources -}}
{{- toYaml .resources -}}
{{- else -}}
{{- toYaml .default -}}
{{- end -}}
{{- end -}}
