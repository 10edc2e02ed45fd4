def render_flavour(flavour):
    return {}
