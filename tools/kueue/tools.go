//go:build tools

// Package tools pins Kueue (sigs.k8s.io/kueue) for the tests: tests/kit/kueue.py builds
// its manager, sigs.k8s.io/kueue/cmd/kueue, from this module's requirements and installs
// its CRDs, RBAC and webhooks from the module's config/ directory.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
