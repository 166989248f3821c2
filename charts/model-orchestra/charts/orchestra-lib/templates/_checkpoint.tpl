{{/*
Checkpoint wiring (docs/checkpoint.md), shared by the parts that render the
seat sidecar (topology), the node agent (agent) and the dispatcher that
drives both. An application sleeps when its values have lifecycle.sleep,
written by the values translator from the effective sleep policy.
*/}}

{{/* The port of the seat sidecar in every root pod of a sleeping
application (container port "seat").
containerPort: {{ include "mo.seatPort" $ }} */}}
{{- define "mo.seatPort" -}}
9300
{{- end -}}

{{/* The port of the node agent (container port "agent").
containerPort: {{ include "mo.agentPort" $ }} */}}
{{- define "mo.agentPort" -}}
9301
{{- end -}}

{{/* The names of the sleeping applications, comma-separated and sorted;
empty when none sleeps.
{{- $sleeping := include "mo.sleepingApps" $ | splitList "," | compact }} */}}
{{- define "mo.sleepingApps" -}}
{{- $names := list -}}
{{- range $app, $spec := .Values.global.applications -}}
{{- if and $spec.lifecycle $spec.lifecycle.sleep -}}
{{- $names = append $names $app -}}
{{- end -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* The node directory of one namespace's copies in a tier, as the node
agent lays them out ("<root>/<namespace>/<artifact>"): what a sleeping
application's pods mount.
path: {{ include "mo.tierNamespacePath" (dict "root" $ "tier" "hot") }} */}}
{{- define "mo.tierNamespacePath" -}}
{{- $agent := .root.Values.global.agent -}}
{{- $base := ternary $agent.hotPath $agent.warmPath (eq .tier "hot") -}}
{{- printf "%s/%s" (trimSuffix "/" $base) .root.Release.Namespace -}}
{{- end -}}

{{/* The app.kubernetes.io/component of the node agent's pods, which the
dispatcher selects them by.
component: {{ include "mo.agentComponent" $ }} */}}
{{- define "mo.agentComponent" -}}
checkpoint-agent
{{- end -}}
