"""What the user asks for: recipes and cluster profiles."""
