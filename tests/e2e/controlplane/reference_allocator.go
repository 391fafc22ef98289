package main

func runReferenceAllocator() int { return 1 }
