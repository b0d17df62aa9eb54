"""/api/v1/'s views, one module per part of the product, and the API's description page. Thin: parse, call a
selector or a service, answer (tests/house/test_views_layering.py)."""
