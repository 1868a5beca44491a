"""What the tests share: the in-process pipeline harness, capture builders, the fork server, screenshots."""
