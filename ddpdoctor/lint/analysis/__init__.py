"""The analysis layer: what the rules know about the code, layered bottom-up."""
