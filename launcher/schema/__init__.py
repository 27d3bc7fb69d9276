"""What the user asks for: recipes and cluster profiles."""

from pydantic.plugin import _loader as _pydantic_plugins

# On its first model class pydantic reads the entry points of every installed distribution
# to find plugins: about 30 ms of every CLI call in a full environment, for plugins these
# models do not use. An empty registry is what it caches after finding none.
if getattr(_pydantic_plugins, "_plugins", ()) is None:
    _pydantic_plugins._plugins = {}
