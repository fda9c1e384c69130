"""Pure decisions and vocabulary: values in, values out, no I/O."""
