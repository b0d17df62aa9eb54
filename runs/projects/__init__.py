"""Projects: every run belongs to one; people are viewers, editors or owners of a project, and see and
launch runs by those roles (runs.projects.access)."""
