"""The pages, the JSON API they poll, their forms and URLs: thin, they call services and selectors."""
