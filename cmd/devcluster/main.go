// Command devcluster runs the local Kubernetes cluster of `make run` and
// packs images for it:
//
//	devcluster up [--images DIR]       start a real-node cluster in the background
//	devcluster status                  show whether it runs
//	devcluster import IMAGE.tar...     import image tarballs into its node
//	devcluster down                    stop it and clean up the host
//	devcluster image --binary B --ref R --out T   pack a static binary as an image
//
// See docs/localcluster.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/model-orchestra/operator/internal/localcluster"
	"github.com/model-orchestra/operator/internal/ociimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		_, _ = fmt.Fprintln(os.Stderr, "devcluster:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "devcluster",
		Short:         "Run a local Kubernetes cluster for Model Orchestra development",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	stateDir := root.PersistentFlags().String("state-dir", defaultStateDir(), "directory of the detached cluster's state, logs and kubeconfig")
	root.AddCommand(newUpCommand(stateDir), newServeCommand(stateDir), newDownCommand(stateDir),
		newStatusCommand(stateDir), newImportCommand(stateDir), newImageCommand())
	return root
}

// defaultStateDir is <module root>/.localcluster, or ./.localcluster
// outside the repository.
func defaultStateDir() string {
	if root, err := localcluster.ModuleRoot(); err == nil {
		return filepath.Join(root, ".localcluster")
	}
	return ".localcluster"
}

func newUpCommand(stateDir *string) *cobra.Command {
	var (
		opts       localcluster.Options
		controlOff bool
		kwokNodes  []string
		imageDirs  []string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a cluster in the background and print how to use it",
		Long: `Start a cluster that outlives this command. By default it has a real node
(containerd, kubelet, kube-proxy, bridge CNI, cluster DNS, a default
StorageClass) and needs Linux and root; --real-node=false gives a control
plane with kwok nodes that any user can run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.RealNode = !controlOff
			opts.ControllerManager, opts.Scheduler = true, true
			for _, spec := range kwokNodes {
				n, err := parseKwokNode(spec)
				if err != nil {
					return err
				}
				opts.KwokNodes = append(opts.KwokNodes, n)
			}
			for _, dir := range imageDirs {
				tars, err := filepath.Glob(filepath.Join(dir, "*.tar"))
				if err != nil {
					return err
				}
				if len(tars) == 0 {
					return fmt.Errorf("--images %s: no *.tar image tarballs there (run `make images`)", dir)
				}
				opts.Images = append(opts.Images, tars...)
			}
			for i, img := range opts.Images {
				abs, err := filepath.Abs(img)
				if err != nil {
					return err
				}
				opts.Images[i] = abs
			}
			if d := opts.Default(); d.BinDir != "" {
				opts.BinDir, _ = filepath.Abs(d.BinDir)
			}
			if err := opts.Default().Validate(); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "starting the cluster in %s ...\n", *stateDir)
			st, err := localcluster.Up(cmd.Context(), *stateDir, opts, []string{self, "serve"})
			if err != nil {
				return err
			}
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), `cluster is up (ready in %s)
  kubeconfig: %s
  logs:       %s

  export KUBECONFIG=%s
  kubectl get nodes

stop it with: devcluster down --state-dir %s
`, st.StartDuration, st.Kubeconfig, st.LogDir, st.Kubeconfig, *stateDir)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&controlOff, "control-plane-only", false, "no real node: etcd, apiserver, controller-manager, scheduler and kwok nodes (no root needed)")
	f.IntVar(&opts.GPUs, "gpus", 2, "nvidia.com/gpu advertised on the real node (no device behind it)")
	f.StringVar(&opts.GPUProduct, "gpu-product", localcluster.DefaultGPUProduct, "nvidia.com/gpu.product label of the real node")
	f.StringVar(&opts.NodeName, "node-name", localcluster.DefaultNodeName, "name of the real node")
	f.StringSliceVar(&opts.Images, "image", nil, "image tarball to import into the real node (repeatable)")
	f.StringSliceVar(&imageDirs, "images", nil, "directory whose *.tar image tarballs are imported into the real node (repeatable)")
	f.StringSliceVar(&kwokNodes, "kwok-node", nil, "simulated node NAME[:GPUS] (repeatable)")
	f.StringVar(&opts.BinDir, "bin-dir", "", "directory of the Kubernetes binaries (default $MO_BIN_DIR or <repo>/bin)")
	f.DurationVar(&opts.StartTimeout, "timeout", 0, "how long to wait for the cluster (default 5m)")
	return cmd
}

// parseKwokNode parses NAME[:GPUS].
func parseKwokNode(spec string) (localcluster.KwokNode, error) {
	name, gpus, found := strings.Cut(spec, ":")
	n := localcluster.KwokNode{Name: name}
	if found {
		g, err := strconv.Atoi(gpus)
		if err != nil || g < 0 {
			return n, fmt.Errorf("--kwok-node %q: GPUs must be a non-negative number", spec)
		}
		n.GPUs = g
	}
	if name == "" {
		return n, fmt.Errorf("--kwok-node %q: no name", spec)
	}
	return n, nil
}

func newServeCommand(stateDir *string) *cobra.Command {
	return &cobra.Command{
		Use:    "serve",
		Short:  "Run the cluster in the foreground (started by up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localcluster.Serve(context.Background(), *stateDir)
		},
	}
}

func newDownCommand(stateDir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop the cluster and undo its changes to the host (safe to repeat)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			began := time.Now()
			if err := localcluster.Down(cmd.Context(), *stateDir); err != nil {
				return err
			}
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), "cluster down (%s); logs kept in %s\n",
				time.Since(began).Round(10*time.Millisecond), filepath.Join(*stateDir, "logs"))
			return nil
		},
	}
}

func newStatusCommand(stateDir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show whether the cluster runs; exit 1 when it does not",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := localcluster.Status(cmd.Context(), *stateDir)
			if errors.Is(err, localcluster.ErrNotRunning) {
				return fmt.Errorf("%w in %s (start one with `devcluster up`)", err, *stateDir)
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			_, _ = fmt.Fprintf(out, "supervisor pid %d alive=%t, started %s\n", s.SupervisorPID, s.SupervisorAlive, s.Started.Format(time.RFC3339))
			_, _ = fmt.Fprintf(out, "apiserver %s ready=%t %s\n", s.APIServer, s.APIServerReady, s.APIServerError)
			names := make([]string, 0, len(s.Processes))
			for n := range s.Processes {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				_, _ = fmt.Fprintf(out, "  %-24s pid %-7d alive=%t\n", n, s.Processes[n], s.Alive[n])
			}
			_, _ = fmt.Fprintf(out, "kubeconfig %s\nlogs %s\n", s.Kubeconfig, s.LogDir)
			if !s.SupervisorAlive || !s.APIServerReady {
				return errors.New("the cluster is not healthy; `devcluster down` then `devcluster up` starts a fresh one")
			}
			return nil
		},
	}
}

func newImportCommand(stateDir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "import IMAGE.tar...",
		Short: "Import docker-archive image tarballs into the real node",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := localcluster.ImportImages(cmd.Context(), *stateDir, args...); err != nil {
				return err
			}
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), "imported %d image(s)\n", len(args))
			return nil
		},
	}
}

func newImageCommand() *cobra.Command {
	var o ociimage.Options
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Pack a static binary into a docker-archive image tarball",
		Example: `  devcluster image --binary bin/linux_amd64/orchestra-gateway \
    --ref ghcr.io/model-orchestra/orchestra-gateway:v0.1.0 --out _output/images/orchestra-gateway.tar`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			digest, err := ociimage.Pack(o)
			if err != nil {
				return err
			}
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s\n", o.Out, o.Ref, digest)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Binary, "binary", "", "static binary to pack (required)")
	f.StringVar(&o.Ref, "ref", "", "image reference, e.g. ghcr.io/model-orchestra/orchestra-gateway:v0.1.0 (required)")
	f.StringVar(&o.Out, "out", "", "tarball to write (required)")
	f.StringVar(&o.Path, "path", "", "path of the binary in the image (default /<binary name>)")
	f.StringVar(&o.User, "user", ociimage.DefaultUser, "numeric uid:gid to run as")
	f.StringSliceVar(&o.Ports, "port", nil, "exposed port, e.g. 8080 or 53/udp (repeatable)")
	f.StringSliceVar(&o.Args, "arg", nil, "default argument after the entrypoint (repeatable)")
	f.StringArrayVar(&o.Env, "env", nil, "environment variable KEY=value in the image config (repeatable)")
	f.StringToStringVar(&o.Files, "file", nil, "extra file as /path/in/image=host/path (repeatable)")
	for _, req := range []string{"binary", "ref", "out"} {
		_ = cmd.MarkFlagRequired(req)
	}
	return cmd
}
