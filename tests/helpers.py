"""Helpers shared by the unit tests that render roles with Ansible's own machinery."""
import yaml


def role_templar(role_dir, variables):
    """A Templar rooted at a role, with the collection loader that tests/conftest.py installed."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    loader = DataLoader()
    loader.set_basedir(role_dir)
    return Templar(loader=loader, variables=variables)


def load_yaml(path):
    with open(path) as handle:
        return yaml.safe_load(handle) or {}
