// Command testenv runs a real kube-apiserver for nodeagent's tests: an embedded etcd on
// loopback (data in a temporary directory, fsync off) and kube-apiserver from
// k8s.io/kubernetes, in one process, so tests need no container engine or prebuilt binary.
//
// Usage: testenv -etcd-dir DIR -etcd-port N -etcd-peer-port N -- <kube-apiserver flags>
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	dir := flag.String("etcd-dir", "", "etcd data directory (required)")
	port := flag.Int("etcd-port", 0, "etcd client port on 127.0.0.1 (required)")
	peer := flag.Int("etcd-peer-port", 0, "etcd peer port on 127.0.0.1 (required)")
	flag.Parse()
	if *dir == "" || *port == 0 || *peer == 0 {
		fmt.Fprintln(os.Stderr, "testenv: -etcd-dir, -etcd-port and -etcd-peer-port are required")
		os.Exit(2)
	}

	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", *port)}
	peers := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", *peer)}
	cfg := embed.NewConfig()
	cfg.Dir = *dir
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peers}
	cfg.AdvertisePeerUrls = []url.URL{peers}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true // test data: speed over durability
	cfg.LogLevel = "error"
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: etcd did not start: %v\n", err)
		os.Exit(1)
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "testenv: etcd not ready after 60s")
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "testenv: etcd ready on %s\n", client.String())

	cmd := app.NewAPIServerCommand()
	cmd.SetArgs(append(flag.Args(), "--etcd-servers="+client.String()))
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: kube-apiserver: %v\n", err)
		etcd.Close()
		os.Exit(1)
	}
	etcd.Close()
}
