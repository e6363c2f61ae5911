"""Values: the ground floor. The typed values every stage passes on and none owns: the sweep spec and its
parts, the trial's spec and result, ``ErrorKind`` and ``TrialStatus``, the callback protocol, the model
shape catalogue, and the values that cross Ray. Imports no stage."""
