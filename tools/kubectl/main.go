// Command kubectl is kubectl as k8s.io/kubernetes/cmd/kubectl builds it, from the published
// k8s.io/kubectl module of the test API server's version: the tests read the Node with what
// an operator runs (tests/kit/apiserver.py builds it, cached by this module's hash).
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
