print("vlm: not yet implemented")
