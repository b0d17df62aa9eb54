"""Hidden-state extractions on disk: the byte formats (tensor headers, stored dtypes), the layouts users bring
and their manifests, one sample file, the verification of every claim against the files, and the data
directory speculators trains from."""
