"""What runs are made from: paths under the data roots, datasets and their curation, extractions
users bring (import, verification), the demo's assets."""
