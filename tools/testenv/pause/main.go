// Command pause is the sandbox image's process for the kubelet tests: it holds the pod's
// namespaces and exits on SIGTERM or SIGINT, like registry.k8s.io/pause (which the tests
// cannot pull: they reach no registry but their own).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
