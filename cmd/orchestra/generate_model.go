package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/model-orchestra/operator/internal/modelgen"
)

// newGenerateModelCommand writes a llama GGUF model real engines load, for
// tests, demos and benchmarks.
func newGenerateModelCommand() *cobra.Command {
	var (
		out, size, name string
		seed            uint64
		ctxLen          int
	)
	cmd := &cobra.Command{
		Use:   "generate-model -o FILE [--size tiny|300MiB|2GiB] [--seed N]",
		Short: "Write a llama GGUF model with a real tokenizer and chat template (gibberish weights) and print its sha256",
		Long: `generate-model writes a llama-architecture GGUF model that Ollama and llama.cpp load and run:
a gpt2 byte-level BPE tokenizer of 512 tokens, the ChatML chat template, and pseudo-random F16
weights from --seed (the same flags write the same bytes). Its answers are gibberish; the path
through the engine is real.

--size tiny (the default) is the model of the tests and the demo: 2 layers, embedding 64,
4 heads, feed-forward 128, context 256, about 300 KB. Any other size (300MiB, 1GiB, 2.5GiB)
scales the same shape to about that many bytes for benchmarks.

It prints "sha256  FILE" (as sha256sum does), then the model's shape on standard error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("--output (-o) is required")
			}
			c := modelgen.Tiny()
			if size != "tiny" {
				n, err := modelgen.ParseSize(size)
				if err != nil {
					return err
				}
				if c, err = modelgen.ForSize(n); err != nil {
					return err
				}
			}
			c.Seed = seed
			if name != "" {
				c.Name = name
			}
			if ctxLen != 0 {
				c.Context = ctxLen
			}
			if err := c.Validate(); err != nil {
				return err
			}
			start := time.Now()
			sum, n, err := modelgen.WriteFile(out, c)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s  %s\n", sum, out)
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: llama, %d layers, embedding %d, %d heads, feed-forward %d, context %d, %d parameters, %s (%d bytes) in %s\n",
				c.Name, c.Layers, c.Embedding, c.Heads, c.FeedForward, c.Context, c.Parameters(), modelgen.FormatSize(uint64(n)), n, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&out, "output", "o", "", "the GGUF file to write (replaced when complete)")
	fs.StringVar(&size, "size", "tiny", `"tiny", or about how large a model to write: 300MiB, 1GiB, 2.5GiB`)
	fs.Uint64Var(&seed, "seed", 1, "seed of the weights")
	fs.StringVar(&name, "name", "", "general.name in the file (default orchestra-tiny, or orchestra-<size>)")
	fs.IntVar(&ctxLen, "context", 0, "trained context length in tokens (default 256 for tiny, 2048 for larger)")
	return cmd
}
