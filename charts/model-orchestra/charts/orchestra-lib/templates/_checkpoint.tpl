{{/*
Checkpoint wiring (docs/checkpoint.md), shared by the parts that render the
sidecar (topology), the node agent (agent) and the dispatcher that
drives both. An application sleeps when its values have lifecycle.sleep,
written by the values translator from the effective sleep policy.
*/}}

{{/* The port of the sidecar in every root pod of a sleeping
application (container port "sidecar").
containerPort: {{ include "mo.sidecarPort" $ }} */}}
{{- define "mo.sidecarPort" -}}
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

{{/* A pod volume named after the tier ("hot" or "warm"): the namespace's
directory of the node agent's tier on the node.
volumes:
  {{- include "mo.tierVolume" (dict "root" $ "tier" "hot") | nindent 2 }} */}}
{{- define "mo.tierVolume" -}}
- name: {{ .tier }}
  hostPath:
    path: {{ include "mo.tierNamespacePath" . | quote }}
    type: DirectoryOrCreate
{{- end -}}

{{/* The app.kubernetes.io/component of the node agent's pods, which the
dispatcher selects them by.
component: {{ include "mo.agentComponent" $ }} */}}
{{- define "mo.agentComponent" -}}
checkpoint-agent
{{- end -}}

{{/* The applications of one seat group, comma-separated and sorted: an
application's index in this list places its engine and its sidecar in the
group's pod (mo.seatGroupEnginePort, mo.seatGroupSidecarPort).
{{- $apps := include "mo.seatGroupApps" (dict "root" $ "group" $g) | splitList "," | compact }} */}}
{{- define "mo.seatGroupApps" -}}
{{- $names := list -}}
{{- range $app, $spec := .root.Values.global.applications -}}
{{- if and $spec.lifecycle $spec.lifecycle.seat (eq $spec.lifecycle.seat.group $.group) -}}
{{- $names = append $names $app -}}
{{- end -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* The index of an application in its seat group (mo.seatGroupApps).
{{ include "mo.seatGroupIndex" (dict "root" $ "app" $app) }} */}}
{{- define "mo.seatGroupIndex" -}}
{{- $group := (index .root.Values.global.applications .app).lifecycle.seat.group -}}
{{- $apps := include "mo.seatGroupApps" (dict "root" .root "group" $group) | splitList "," | compact -}}
{{- range $i, $a := $apps -}}{{- if eq $a $.app -}}{{ $i }}{{- end -}}{{- end -}}
{{- end -}}

{{/* The port of the i-th engine of a seat group's pod: 8080 + i (a group
holds at most 16 applications, the resource's limit).
containerPort: {{ include "mo.seatGroupEnginePort" $i }} */}}
{{- define "mo.seatGroupEnginePort" -}}
{{- add 8080 (int .) -}}
{{- end -}}

{{/* The port of the i-th sidecar of a seat group's pod: mo.sidecarPort + i, so
9300-9315.
containerPort: {{ include "mo.seatGroupSidecarPort" (dict "root" $ "index" $i) }} */}}
{{- define "mo.seatGroupSidecarPort" -}}
{{- add (int (include "mo.sidecarPort" .root)) (int .index) -}}
{{- end -}}

{{/* The highest sidecar port any pod of the release may use: mo.sidecarPort, or
the last of a seat group's range when the release has seat groups. */}}
{{- define "mo.lastSidecarPort" -}}
{{- if .Values.global.seatGroups -}}
{{- add (int (include "mo.sidecarPort" .)) 15 -}}
{{- else -}}
{{- include "mo.sidecarPort" . -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the release's caller token (key "token"), which
the node agent's mutating endpoints require of their callers (the
dispatcher's lifecycle leader): rendered by the agent part, mounted by the
agent and the dispatcher at mo.agentCallerTokenDir.
secretName: {{ include "mo.agentCallerSecret" $ }} */}}
{{- define "mo.agentCallerSecret" -}}
{{- printf "%s-agent-caller" (include "mo.fullname" .) -}}
{{- end -}}

{{/* Where the agent and its callers mount the caller token Secret; the
token is the file "token" in it. */}}
{{- define "mo.agentCallerTokenDir" -}}
/etc/orchestra/agent-caller
{{- end -}}
