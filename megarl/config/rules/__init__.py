"""Cross-key rules: each module checks one concern over a `View` of the composed config and yields
an `Issue` per problem (megarl.config.validate runs them all)."""
