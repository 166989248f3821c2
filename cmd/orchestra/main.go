// Command orchestra is the Model Orchestra command-line tool. It previews
// offline what the operator renders for a ModelOrchestra resource:
//
//	orchestra template -f cr.yaml [--set path=value]...
//
// renders resources into the Kubernetes objects the operator would apply,
// after validating them as the API server would;
//
//	orchestra values -f cr.yaml > values.yaml
//	helm template NAME charts/model-orchestra -n NAMESPACE -f values.yaml \
//	  --post-renderer orchestra --post-renderer-args post-render \
//	  --post-renderer-args -f --post-renderer-args cr.yaml
//
// previews the same objects with Helm: values prints the chart values the
// operator's translator makes, and post-render runs the operator's
// post-renderers as Helm's --post-renderer (manifests on standard input,
// the result on standard output). NAME and NAMESPACE are the resource's.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/model-orchestra/operator/internal/orchestra/preview"
	"github.com/model-orchestra/operator/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "orchestra",
		Short:         "Model Orchestra command-line tool",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newTemplateCommand(), newValuesCommand(), newPostRenderCommand(), newGenerateModelCommand())
	return root
}

// resourceFlags are the flags that say which resource to preview and how.
type resourceFlags struct {
	file string
	opts preview.Options
}

func (f *resourceFlags) bind(fs *pflag.FlagSet, fileHelp string) {
	fs.StringVarP(&f.file, "file", "f", "", fileHelp)
	fs.StringArrayVar(&f.opts.Set, "set", nil, "set a field of the resource before rendering, e.g. spec.gateway.replicas=3 (repeatable)")
	fs.StringVarP(&f.opts.Namespace, "namespace", "n", "", `namespace of resources that name none (default "default")`)
}

// open returns the resource input: the file, or standard input for "-"
// when stdinOK. The caller closes it.
func (f *resourceFlags) open(cmd *cobra.Command, stdinOK bool) (io.ReadCloser, error) {
	switch {
	case f.file == "":
		return nil, errors.New("--file (-f) is required")
	case f.file == "-" && !stdinOK:
		return nil, errors.New(`--file (-f) must name a file: standard input carries the manifests`)
	case f.file == "-":
		return io.NopCloser(cmd.InOrStdin()), nil
	}
	return os.Open(f.file)
}

// render is the body of the preview commands: it opens the resource input
// (open), runs render with the operator's renderer over it and writes what
// render returns to standard output.
func (f *resourceFlags) render(cmd *cobra.Command, stdinOK bool, render func(p *preview.Renderer, in io.Reader) ([]byte, error)) error {
	in, err := f.open(cmd, stdinOK)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }() // opened read-only
	p, err := preview.New()
	if err != nil {
		return err
	}
	out, err := render(p, in)
	if err != nil {
		return err
	}
	_, err = cmd.OutOrStdout().Write(out)
	return err
}

func newTemplateCommand() *cobra.Command {
	var f resourceFlags
	cmd := &cobra.Command{
		Use:   "template -f FILE",
		Short: "Render ModelOrchestra resources offline, as the operator would apply them",
		Long: `Render ModelOrchestra resources offline into the objects the operator would
apply. Each resource is first validated and defaulted against the
ModelOrchestra CRD (schema and CEL rules, as the API server does); then the
operator's own rendering pipeline runs: values translator, chart, post-
renderers. Secrets referenced by the resource are not read, so config
checksums of external Secrets are placeholders.`,
		Example: `  orchestra template -f config/samples/modelorchestra_v1alpha1_llamacpp.yaml
  orchestra template -f cr.yaml --set spec.applications.chat.scaling.replicas=2
  cat cr.yaml | orchestra template -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.render(cmd, true, func(p *preview.Renderer, in io.Reader) ([]byte, error) {
				out, err := p.Template(cmd.Context(), in, f.opts)
				return []byte(out), err
			})
		},
	}
	f.bind(cmd.Flags(), `file holding ModelOrchestra resources ("-" reads standard input)`)
	cmd.Flags().StringVar(&f.opts.KubeVersion, "kube-version", "", "Kubernetes version to render for (default "+preview.DefaultKubeVersion+")")
	return cmd
}

func newValuesCommand() *cobra.Command {
	var f resourceFlags
	cmd := &cobra.Command{
		Use:   "values -f FILE",
		Short: "Print the chart values the operator renders a ModelOrchestra resource with",
		Long: `Print, as YAML, the values of the model-orchestra chart that the operator
renders one ModelOrchestra resource with: the resource, validated and
defaulted as the API server would, through the values translator, with the
overrideValues of the embedded watches.yaml on top. With post-render as
Helm's post-renderer, helm template then prints what the operator applies.`,
		Example: `  orchestra values -f cr.yaml > values.yaml
  helm template NAME charts/model-orchestra -n NAMESPACE -f values.yaml \
    --post-renderer orchestra --post-renderer-args post-render \
    --post-renderer-args -f --post-renderer-args cr.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.render(cmd, true, func(p *preview.Renderer, in io.Reader) ([]byte, error) {
				return p.Values(cmd.Context(), in, f.opts)
			})
		},
	}
	f.bind(cmd.Flags(), `file holding one ModelOrchestra resource ("-" reads standard input)`)
	return cmd
}

func newPostRenderCommand() *cobra.Command {
	var f resourceFlags
	cmd := &cobra.Command{
		Use:   "post-render -f FILE",
		Short: "Run the operator's post-renderers, as Helm's --post-renderer",
		Long: `Read the manifests Helm rendered for one ModelOrchestra resource from
standard input, run the operator's post-renderers over them (those of the
embedded watches.yaml, with its configuration, then the engine's standard
labels and owner references) and write the result to standard output. The
resource (-f) is needed because the post-renderers read it; Helm must render
the release under the resource's name and namespace, which is checked.
Secrets that the chart does not render are not read, so config checksums
of external Secrets are placeholders, as with orchestra template.`,
		Example: `  helm template NAME charts/model-orchestra -n NAMESPACE -f values.yaml \
    --post-renderer orchestra --post-renderer-args post-render \
    --post-renderer-args -f --post-renderer-args cr.yaml
  helm install NAME charts/model-orchestra -n NAMESPACE -f values.yaml --dry-run \
    --post-renderer orchestra --post-renderer-args post-render \
    --post-renderer-args -f --post-renderer-args cr.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.render(cmd, false, func(p *preview.Renderer, in io.Reader) ([]byte, error) {
				var manifest bytes.Buffer
				if _, err := manifest.ReadFrom(cmd.InOrStdin()); err != nil {
					return nil, fmt.Errorf("reading the manifests from standard input: %w", err)
				}
				return p.PostRender(cmd.Context(), in, manifest.Bytes(), f.opts)
			})
		},
	}
	f.bind(cmd.Flags(), "file holding the one ModelOrchestra resource the manifests were rendered for")
	return cmd
}
