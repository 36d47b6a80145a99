package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

// Output formats of --output.
const (
	OutputText = "text"
	OutputJSON = "json"
)

// OutputFlag adds --output text|json to c, bound to p, with its completion. CheckOutput
// refuses other values; the command calls it before it does anything.
func OutputFlag(c *cobra.Command, p *string) {
	c.Flags().StringVar(p, "output", OutputText, "output format: `text|json`")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{OutputText, OutputJSON}, cobra.ShellCompDirectiveNoFileComp))
}

// CheckOutput refuses an --output value other than text or json (empty means text).
func CheckOutput(v string) error {
	switch v {
	case "", OutputText, OutputJSON:
		return nil
	}
	return fmt.Errorf("--output %q: use text or json", v)
}
