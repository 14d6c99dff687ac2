print("stress: not yet written")
