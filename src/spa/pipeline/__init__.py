"""The one-command pipeline: recipes, stages, reports and comparisons."""
