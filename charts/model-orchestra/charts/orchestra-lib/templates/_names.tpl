{{/*
Names. Every object is prefixed with the release name (the ModelOrchestra
name, at most 40 characters). Per-application names are "<release>-<app>",
shortened to 40 characters with a stable hash suffix when longer, so that
"<name>-worker-g<replica>" stays within the 52 characters a StatefulSet name
may have.
*/}}

{{/* The release's prefix of every object name.
{{ include "mo.fullname" $ }} */}}
{{- define "mo.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The name of one application's objects.
{{ include "mo.appFullname" (dict "root" $ "app" $name) }} */}}
{{- define "mo.appFullname" -}}
{{- $name := printf "%s-%s" (include "mo.fullname" .root) .app -}}
{{- if gt (len $name) 40 -}}
{{- printf "%s-%s" ($name | trunc 33 | trimSuffix "-") ($name | sha256sum | trunc 6) -}}
{{- else -}}
{{- $name -}}
{{- end -}}
{{- end -}}

{{/* The name of one seat group's objects (its StatefulSet, headless
Service and ResourceClaimTemplate): "<release>-seat-<group>", shortened
like mo.appFullname.
{{ include "mo.seatGroupFullname" (dict "root" $ "group" $name) }} */}}
{{- define "mo.seatGroupFullname" -}}
{{- $name := printf "%s-seat-%s" (include "mo.fullname" .root) .group -}}
{{- if gt (len $name) 40 -}}
{{- printf "%s-%s" ($name | trunc 33 | trimSuffix "-") ($name | sha256sum | trunc 6) -}}
{{- else -}}
{{- $name -}}
{{- end -}}
{{- end -}}
