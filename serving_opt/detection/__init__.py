"""Detection models: an Object-Detection-API-shaped sample, matching detections of two
runs, and finding the outputs that pass through discontinuous ops (NMS, TopK, ArgMax).
"""
