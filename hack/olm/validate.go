package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/model-orchestra/operator/internal/olm/bundle"
	"github.com/model-orchestra/operator/internal/olm/catalog"
	"github.com/model-orchestra/operator/internal/olm/check"
)

func newValidateBundleCommand(root *string) *cobra.Command {
	var dockerfile string
	cmd := &cobra.Command{
		Use:   "validate-bundle [DIR...]",
		Short: "Validate bundles (default bundle/) with operator-framework's validators and this project's rules",
		Long: `Validate bundle directories (default bundle/) with operator-framework/api's
validators, as operator-sdk bundle validate --select-optional
suite=operatorframework runs them (the default validators, OperatorHub v2,
capabilities, categories, deprecated APIs for Kubernetes ` + bundle.KubeVersion + `, good
practices), and with the rules those libraries lack; see docs/olm.md. The
first bundle's image Dockerfile (--dockerfile, default bundle.Dockerfile;
empty to skip) must carry the same labels as its annotations.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = []string{"bundle"}
			}
			failed := false
			for i, dir := range args {
				b, err := bundle.Load(filepath.Join(*root, dir))
				if err != nil {
					return err
				}
				rep, err := bundle.ValidateUpstream(filepath.Join(*root, dir))
				if err != nil {
					return err
				}
				rep.Merge(bundle.Validate(b))
				if i == 0 && dockerfile != "" {
					data, err := os.ReadFile(filepath.Join(*root, dockerfile))
					if err != nil {
						return err
					}
					rep.Merge(bundle.ValidateDockerfile(data, b.Annotations))
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s (%s):\n", dir, b.CSV.Name)
				if err := rep.Print(cmd.OutOrStdout()); err != nil {
					return err
				}
				failed = failed || rep.HasErrors()
			}
			if failed {
				return errFindings
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dockerfile, "dockerfile", "bundle.Dockerfile", "image Dockerfile of the first bundle (empty: not checked)")
	return cmd
}

func newValidateCatalogCommand(root *string) *cobra.Command {
	return &cobra.Command{
		Use:   "validate-catalog [DIR]",
		Short: "Validate a File-Based Catalog (default catalog/configs) exactly as opm validate does",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "catalog/configs"
			if len(args) == 1 {
				dir = args[0]
			}
			fsys := os.DirFS(filepath.Join(*root, dir))
			if err := catalog.Validate(cmd.Context(), fsys); err != nil {
				return fmt.Errorf("%s: %w", dir, err)
			}
			sum, err := catalog.Summary(cmd.Context(), fsys)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid (opm validate): %s\n", dir, sum)
			return nil
		},
	}
}

func printReport(cmd *cobra.Command, rep check.Report) error {
	if err := rep.Print(cmd.OutOrStdout()); err != nil {
		return err
	}
	if rep.HasErrors() {
		return errFindings
	}
	return nil
}
