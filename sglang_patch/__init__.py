"""SGLang plugin entry point (group ``sglang.srt.plugins``, name ``ebctl``).

Placeholder until the plugin issue lands: ``register()`` installs no hook, so an SGLang server with
``SGLANG_PLUGINS=ebctl`` behaves exactly as stock.
"""


def register() -> None:
    """Called by SGLang's ``load_plugins()`` in each scheduler process. Installs nothing yet."""
