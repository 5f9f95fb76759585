package main

import "errors"

func runSim(args []string) error { return errors.New("not implemented yet") }
