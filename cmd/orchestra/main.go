// Command orchestra is the Model Orchestra command-line tool.
//
//	orchestra template -f cr.yaml [--set path=value]...
//
// renders ModelOrchestra resources offline into the Kubernetes objects the
// operator would apply, after validating them as the API server would.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/spf13/cobra"

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
	root.AddCommand(newTemplateCommand())
	return root
}

func newTemplateCommand() *cobra.Command {
	var (
		file string
		opts preview.Options
	)
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
			if file == "" {
				return fmt.Errorf("--file (-f) is required")
			}
			in := cmd.InOrStdin()
			if file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return err
				}
				defer func() { _ = f.Close() }() // opened read-only
				in = f
			}
			p, err := preview.New()
			if err != nil {
				return err
			}
			out, err := p.Template(cmd.Context(), in, opts)
			if err != nil {
				return err
			}
			_, err = io.WriteString(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", `file holding ModelOrchestra resources ("-" reads standard input)`)
	cmd.Flags().StringArrayVar(&opts.Set, "set", nil, "set a field of the resource before rendering, e.g. spec.gateway.replicas=3 (repeatable)")
	cmd.Flags().StringVarP(&opts.Namespace, "namespace", "n", "", `namespace of resources that name none (default "default")`)
	cmd.Flags().StringVar(&opts.KubeVersion, "kube-version", "", "Kubernetes version to render for (default "+preview.DefaultKubeVersion+")")
	return cmd
}
