"""Files from other projects, unchanged, with their licences (see each folder's README)."""
