#!/bin/sh
# Approve the InstallPlans of namespace $1 that wait for approval
# (installPlanApproval: Manual), as docs/install.md shows.
set -eu
ns=$1
for ip in $(kubectl -n "$ns" get installplan -o jsonpath='{range .items[?(@.spec.approved==false)]}{.metadata.name}{" "}{end}'); do
	kubectl -n "$ns" patch installplan "$ip" --type merge -p '{"spec":{"approved":true}}'
done
