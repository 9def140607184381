"""Make the checkout importable as ansible_collections.llmops.serving for unit tests."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
