#!/bin/sh
# Copies the Gateway API CRDs that crds/ holds from the module go.mod
# requires (its experimental channel, as daemonset/crds installs), so that
# the embedded copies match the typed clients. Run by go generate;
# TestEmbeddedCRDsAreFresh fails when they do not match.
set -eu
go mod download sigs.k8s.io/gateway-api
src="$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)/config/crd/experimental"
cd crds
for f in *.yaml; do
	install -m 644 "$src/$f" "$f"
done
