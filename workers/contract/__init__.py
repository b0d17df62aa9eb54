"""What the web tier and the workers share, torch-free: what a user got wrong (errors), a stage's failure in
a user's words (failures), a target's config (target), acceptance arithmetic, progress callbacks and demo
builds; and, by folder, hidden-state extractions on disk and their verification (extraction/), chat files and
prompts (chats/), what a user names, read safely (inputs/), what this host can run and where its vLLM lives
(host/), and a trained draft on its way to serving (checkpoints/). Imports no torch, transformers or
speculators at module level, and nothing of the stages or of the Django app: the one part of workers/ the
web tier imports."""
