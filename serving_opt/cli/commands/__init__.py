"""One module per `serving-opt` command: SUMMARY, define_flags(fv), main(fv)."""
