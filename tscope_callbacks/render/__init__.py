"""Rendering of analysis objects: text tables, markdown/CSV/JSON/console reports, plots. Analysis never imports this
layer; renderers take analysis objects."""
