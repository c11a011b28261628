// Command deviceplugin is the test device plugin: it serves one resource with -count healthy
// devices over the kubelet's device-plugin API v1beta1, so capacity and allocatable come
// from a real kubelet. It re-registers when the kubelet restarts (the kubelet removes every
// socket in the plugin directory when it starts, which is how a plugin learns of it).
//
// Each allocation hands the container the -device nodes, as the RDMA shared device plugin
// (Mellanox/k8s-rdma-shared-dev-plugin, pkg/resources/rdma_device_spec.go) hands it
// /dev/infiniband/uverbsN, rdma_cm and umadN: a DeviceSpec per node, permissions "rwm", which
// the runtime creates in the container and lets its device cgroup open.
//
// Usage: deviceplugin -resource rdma/hca -count 4 [-dir /var/lib/kubelet/device-plugins]
//
//	[-reregister-delay 3s] [-device HOSTPATH=CONTAINERPATH ...]
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	api.UnimplementedDevicePluginServer
	devices []*api.Device
	specs   []*api.DeviceSpec
}

// deviceFlags collects -device HOSTPATH=CONTAINERPATH.
type deviceFlags []*api.DeviceSpec

func (d *deviceFlags) String() string { return fmt.Sprint(len(*d)) }

func (d *deviceFlags) Set(v string) error {
	host, container, ok := strings.Cut(v, "=")
	if !ok || !filepath.IsAbs(host) || !filepath.IsAbs(container) {
		return fmt.Errorf("want HOSTPATH=CONTAINERPATH, both absolute: %q", v)
	}
	*d = append(*d, &api.DeviceSpec{HostPath: host, ContainerPath: container, Permissions: "rwm"})
	return nil
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, s grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	if err := s.Send(&api.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	resp := &api.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses,
			&api.ContainerAllocateResponse{Devices: p.specs})
	}
	return resp, nil
}

// serve starts the plugin's gRPC server on sock and registers it with the kubelet.
func serve(p *plugin, dir, sock, resource string) (*grpc.Server, error) {
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	api.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version: api.Version, Endpoint: filepath.Base(sock), ResourceName: resource,
	})
	if err != nil {
		srv.Stop()
		return nil, err
	}
	return srv, nil
}

func main() {
	resource := flag.String("resource", "", "resource name, e.g. rdma/hca (required)")
	count := flag.Int("count", 1, "number of healthy devices")
	dir := flag.String("dir", api.DevicePluginPath, "the kubelet's device-plugin directory")
	delay := flag.Duration("reregister-delay", 0,
		"wait this long before registering again after a kubelet restart (a slow plugin)")
	var specs deviceFlags
	flag.Var(&specs, "device", "HOSTPATH=CONTAINERPATH: a device node each allocation hands "+
		"the container (repeatable)")
	flag.Parse()
	if *resource == "" {
		fmt.Fprintln(os.Stderr, "deviceplugin: -resource is required")
		os.Exit(2)
	}
	p := &plugin{specs: specs}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &api.Device{ID: fmt.Sprintf("dev%d", i), Health: api.Healthy})
	}
	sock := filepath.Join(*dir, fmt.Sprintf("nodeagent-test-%d.sock", os.Getpid()))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var srv *grpc.Server
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(sock); srv == nil || err != nil {
			if srv != nil {
				srv.Stop()
				srv = nil
				fmt.Fprintf(os.Stderr, "deviceplugin: socket removed (kubelet restarted): "+
					"registering again in %s\n", *delay)
				time.Sleep(*delay)
			}
			s, err := serve(p, *dir, sock, *resource)
			if err != nil {
				fmt.Fprintf(os.Stderr, "deviceplugin: not registered yet: %v\n", err)
			} else {
				srv = s
				fmt.Fprintf(os.Stderr, "deviceplugin: registered %s x%d\n", *resource, *count)
			}
		}
		select {
		case <-stop:
			if srv != nil {
				srv.Stop()
			}
			_ = os.Remove(sock)
			return
		case <-tick.C:
		}
	}
}
